"""Prompt templates as versioned YAML data files (shipped as package data)."""
