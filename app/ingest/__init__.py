"""The core's ingest: the pipeline and its stages, admission, tenant slots, settlement, the
template miners and their snapshots (DESIGN.md §5).
"""
