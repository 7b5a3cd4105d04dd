-- A sale's picture: an https:// address or a path on this site (see
-- domain::parse_image_url); none shows the placeholder.
ALTER TABLE sales
    ADD COLUMN image_url TEXT CHECK (image_url IS NULL OR length(image_url) BETWEEN 1 AND 2048);
