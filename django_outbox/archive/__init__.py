"""The archive and the tables' upkeep: retention, partitions, replay of dead letters,
autovacuum tuning."""
