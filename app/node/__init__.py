"""The process: assembly and start-up (server), recovery, configuration, metrics, events,
worker supervision, the data-directory lock and disk space (DESIGN.md §5, §6, §8, §9).
"""
