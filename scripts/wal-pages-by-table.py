#!/usr/bin/env python3
"""What a stretch of SQLite commits wrote to the WAL, page by page: the pages of each
table and index, and the flushes, from an
`strace -f -y -xx -s 4 -e trace=pwrite64,pread64,fdatasync,fsync` log of the writing
process, named with the database's `dbstat` after it closed; and the reads of the
database file and of the WAL that missed SQLite's own page caches.

    wal-pages-by-table.py STRACE_LOG DATABASE CALLS

Prints one line: WAL pages per call | WAL flushes per call | reads per call of the
database file and of the WAL | pages per call by table.
A WAL frame is a 24-byte header (the page number first, big-endian) then the page, so
the frame headers name the pages; a page freed and reused by another table before the
end is counted as the later one's.
"""
import collections
import re
import sqlite3
import sys

log, database, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
# A call another thread interrupted is split: its arguments on the `<unfinished ...>` line.
write = re.compile(r'pwrite64\((\d+)(?:<[^>]*>)?, "((?:\\x[0-9a-f]{2})*)"(?:\.\.\.)?, (\d+), \d+(?:\)| <unfinished)')
flush = re.compile(r'(?:fdatasync|fsync)\((\d+)')
read = re.compile(r'pread64\(\d+<([^>]*)>')
reads = collections.Counter()
pages = collections.Counter()
frames_by_fd = collections.Counter()
flushes_by_fd = collections.Counter()
for line in open(log):
    if "resumed>" in line:
        continue  # the second half of a split call: counted at its start
    if m := write.search(line):
        if m.group(3) == "24":
            header = bytes.fromhex(m.group(2).replace("\\x", ""))
            pages[int.from_bytes(header[:4], "big")] += 1
            frames_by_fd[m.group(1)] += 1
    elif m := flush.search(line):
        flushes_by_fd[m.group(1)] += 1
    elif m := read.search(line):
        reads["WAL" if m.group(1).endswith("-wal") else "database"] += 1
owner = {page: name for name, page in sqlite3.connect(database).execute("SELECT name, pageno FROM dbstat")}
tables = collections.Counter()
for page, count in pages.items():
    tables[owner.get(page, "(freed)")] += count
wal_flushes = sum(flushes_by_fd[fd] for fd in frames_by_fd)
total = sum(tables.values())
by_table = ", ".join(f"{name} {count / calls:.2f}" for name, count in tables.most_common())
print(
    f"{total / calls:.2f} | {wal_flushes / calls:.2f} | "
    f"{reads['database'] / calls:.2f} / {reads['WAL'] / calls:.2f} | {by_table}"
)
