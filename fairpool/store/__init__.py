"""The embedded store: schema, migrations, transactions, records and queries.

``db`` opens a database and hands out read and write transactions, ``repo`` runs the queries
on a transaction's connection and returns the frozen records of ``records``.
"""
