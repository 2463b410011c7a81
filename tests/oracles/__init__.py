"""Reference forms of rules the product implements once, in another shape: the tests hold the
product to them, bit for bit."""
