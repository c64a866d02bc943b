"""The background cadences: the barrier, housekeeping, the age sweep and archival
(DESIGN.md §5, §12).
"""
