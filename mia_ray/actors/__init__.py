"""One class per model role, each served by ``Dataset.map_batches`` with an actor pool."""
