"""The three-tier feature cache (memory, Redis, disk) behind a Bloom filter.

Reserved import name: the cache arrives with its own issue; nothing here yet.
"""
