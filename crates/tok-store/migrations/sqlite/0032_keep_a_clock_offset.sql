-- How far the store's clock (`db_now!`) is ahead of SQLite's: always 0 but
-- in `tok test`, whose virtual clock moves it to the next due job instead
-- of waiting for it. One row.
CREATE TABLE clock_offset (
    offset_ms  INTEGER NOT NULL
);
INSERT INTO clock_offset (offset_ms) VALUES (0);
