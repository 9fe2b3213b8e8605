"""Long-context evaluation (``llamafactory-zebra eval-long``): RULER-style tasks, scoring, reports, chunked prefill."""
