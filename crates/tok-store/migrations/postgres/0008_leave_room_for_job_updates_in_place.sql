-- A job row is updated at every step of its run (lease, path, token). With
-- room left on its page and no indexed column changed, PostgreSQL updates
-- it in place (a HOT update): no new index entries, so the claim's and the
-- record's index lookups do not wade through dead versions.
ALTER TABLE jobs SET (fillfactor = 50);
