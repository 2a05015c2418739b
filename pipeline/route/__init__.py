"""route"""
