"""Data partitions, envelope encryption, sandbox runtimes, access control, audit and masking.

Reserved import name: the sandbox arrives with its own issue; nothing here yet.
"""
