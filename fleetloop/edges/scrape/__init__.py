"""``fleetloop scrape``: serving runtimes' Prometheus metrics in, ``NodeTelemetry`` out.

:mod:`.runtimes` names every metric per runtime and release (with where it was read),
:mod:`.convert` turns two scrapes into one record (pure: no I/O, no clock), :mod:`.page` reads a
page with its size capped as it is read, :mod:`.command` is the scrape loop and the CLI.
"""
