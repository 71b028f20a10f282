"""What a request does to the logits before they are sampled: its penalties and logit bias
(``processors``) and the grammar its output must follow (``grammar``: ``response_format``, forced tool
calls). Applied alike to the target's verdicts and to local drafts, position by position."""
