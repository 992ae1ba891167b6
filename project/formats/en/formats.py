"""The formats Django uses for LANGUAGE_CODE "en" / "en-us" (see project/formats/__init__.py).

Django's date-format characters: Y-m-d year-month-day, H:i:s 24-hour time; a backslash
prints the next letter as it is ("UTC").
"""

DATETIME_FORMAT = r"Y-m-d H:i:s \U\T\C"
SHORT_DATETIME_FORMAT = DATETIME_FORMAT
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = DATE_FORMAT
TIME_FORMAT = "H:i:s"
YEAR_MONTH_FORMAT = "Y-m"  # the admin's date drill-down
MONTH_DAY_FORMAT = "Y-m-d"
