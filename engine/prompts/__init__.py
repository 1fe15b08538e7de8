"""How a chat becomes token ids, and a reply's text becomes its parts.

chat_template.py (the model's template, rendered in Jinja's sandbox), template_sandbox.py,
template_filters.py and template_limits.py (every operation sized against the render's budget),
control_tokens.py (control tokens a user types stay text), prompt.py (the one prompt pipeline),
prompt_limit.py (a prompt too long, told before rendering), formats/ (a reply's reasoning, content and
tool calls in each family's markup).

May import: protocol only (no torch, no model).
"""
