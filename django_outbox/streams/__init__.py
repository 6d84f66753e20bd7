"""Streams: publish into a buffer, claim a group, hand it to one bulk handler, archive it."""
