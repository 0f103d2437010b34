"""The independent validator now lives in the core (:mod:`apportion.validator`), where the
pipeline reads it without reaching above itself; this name stays for existing callers."""

from apportion.validator import ValidationResult, validate

__all__ = ["ValidationResult", "validate"]
