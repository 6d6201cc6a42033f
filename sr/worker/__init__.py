"""sr.worker"""
