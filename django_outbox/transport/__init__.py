"""The hand-off to django-q2 (the only reader of its configuration) and its schedules."""
