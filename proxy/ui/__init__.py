"""The forensic map: web pages of a session's prefix boundaries (`proxy.ui.page`, `proxy.ui.routes`)."""
