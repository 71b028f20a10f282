"""Draft sources: where the engine gets its drafts.

``base`` defines the interface the engine speaks; ``local`` drafts on this
machine. Remote sources (a worker over the stream protocol, or the per-op
baseline) implement the same interface.
"""
