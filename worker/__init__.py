"""The worker: everything that runs on a drafting machine.

A worker loads a draft model, serves it over gRPC and announces itself over
Bonjour, so coordinators on the LAN can draft with it.
"""
