"""Gradient building: the gradient graphs of a prepared model (two builders), their rewrites, the portable form."""
