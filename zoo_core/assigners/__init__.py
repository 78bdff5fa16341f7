"""Label assigners: which anchors (or queries) of a dense detector learn which ground-truth box."""
