"""Scoring: the math-verify reward in killable worker processes, pass@k metrics and interval statistics."""
