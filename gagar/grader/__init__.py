"""Groupwise graders: shared workspace, heuristic grader, agentic grader, grader service."""
