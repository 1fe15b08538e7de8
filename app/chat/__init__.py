"""The chat: one conversation as the window holds it (session.py, without Qt), where its replies come from
(backend.py: the local engine; remote.py: an OpenAI-compatible endpoint), the message view and its parts
(view.py, bubbles.py, reasoning_view.py, reply_footer.py, markdown_stream.py and markdown_render.py), the
composer and what is dropped into it (composer.py, attachments.py, documents.py, file_drop.py), the reply's
course (reply_flow.py, waiting.py), the chat list (conversation_list.py, last_active.py), and per-chat
settings (settings.py, defaults.py).
"""
