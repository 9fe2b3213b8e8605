"""Helpers for tests/integration/test_webui_e2e.py: the LlamaBoard server, headless Chromium and a Gradio page
driver."""
