"""The coordinator: everything that runs on the target machine.

It runs the target model, takes drafts from a draft source (local, or a
remote worker), verifies them, and measures the whole thing.
"""
