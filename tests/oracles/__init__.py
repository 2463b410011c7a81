"""Reference forms: the plain statement of a rule whose production form is made fast, kept here as
the oracle the property tests hold the production form to (equal, bit for bit)."""
