"""``fleetloop bench``: benchmarks that print figures (ratios against a baseline measured in the
same run), never timed tests. Each ``fleetloop/bench/<name>.py`` registers one subcommand."""
