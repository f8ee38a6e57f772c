//! Renderers: diagnostics as text for people (miette) and for machines (JSON, SARIF, GitHub).
