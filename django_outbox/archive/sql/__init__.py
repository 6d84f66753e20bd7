"""The SQL of the partitioned archive and of table health."""
