"""Configuration: the one schema every config starts from, and every value checked
before any work.
"""
