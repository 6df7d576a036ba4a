"""Cross-seed tables, the checklist, figures and Markdown/HTML output (rules training_summary, aggregate, figures)."""
