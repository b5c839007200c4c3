"""The NodeMaintenance API: constants, pydantic models and the CRD.

This package depends on nothing else in nmo; everything else depends on it.
"""
