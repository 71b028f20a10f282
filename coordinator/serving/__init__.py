"""``coordinator serve``'s parts: requests, the queue, text and stop sequences, responses, the HTTP app."""
