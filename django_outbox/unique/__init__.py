"""Unique and scheduled jobs: one table per job kind, rows as the source of truth.

* :mod:`~django_outbox.unique.options` reads a kind's ``class Job:`` options;
* :mod:`~django_outbox.unique.enqueue` inserts a job unless an equivalent one has not started;
* :mod:`~django_outbox.unique.dispatch` hands ready jobs to django-q2 and rescues
  expired leases;
* :mod:`~django_outbox.unique.execute` runs one attempt of a job under its lease;
* :mod:`~django_outbox.unique.checks` validates every kind's options.

The model side is :class:`django_outbox.models.UniqueJob`; its SQL lives in
:mod:`django_outbox.unique.sql`.
"""
