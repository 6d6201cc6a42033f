"""sr.pool"""
