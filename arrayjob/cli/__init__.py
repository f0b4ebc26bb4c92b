"""Thin click commands: parse, call one function, print, map errors to exit codes."""
