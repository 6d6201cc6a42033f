"""sr.router"""
