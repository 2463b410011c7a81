"""The command line: ``fleetloop`` and its subcommands, each loaded only when it runs. The top of
the house: it may import every package, and none imports it."""
