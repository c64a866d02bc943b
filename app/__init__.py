"""The node: ``receive`` (the receivers and the worker side), ``ingest`` (the core's
pipeline), ``cadence`` (the background cadences), ``node`` (assembly and the process's
toolbox), ``cli`` (the ``ourios`` command), and two ground-floor modules every floor
uses: ``points`` (the named sync points tests hold threads at) and ``threads`` (the
supervisor every long-lived thread runs under, DESIGN.md §5.10). DESIGN.md §2 is the
layout; docs/ARCHITECTURE.md walks a request through it.
"""
