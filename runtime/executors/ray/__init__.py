"""The Ray executor's room: actors in placement groups (:mod:`.executor`) and ``apportion
cluster import --from ray`` (:mod:`.importer`)."""
