"""sr.models"""
