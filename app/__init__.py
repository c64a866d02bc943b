"""The node, in floors that import only down (DESIGN.md §2): ``base`` (the ground floor:
the vocabulary every floor speaks — the batch, the rejections, the settings, events,
disk space, the collector and allocator policies), ``receive`` (the receivers and the
worker side), ``ingest`` (the core's pipeline), ``cadence`` (the background cadences),
``node`` (the assembly at the top), ``cli`` (the ``ourios`` command); and two
ground-floor modules every floor uses: ``points`` (the named sync points tests hold
threads at) and ``threads`` (the supervisor every long-lived thread runs under,
DESIGN.md §5.10). docs/ARCHITECTURE.md walks a request through it.
"""
