"""The Kubernetes executor's room: TrainJob / JobSet / PyTorchJob objects per allocation
(:mod:`.executor`, :mod:`.manifests`), the API client (:mod:`.client`), the executor's
settings file (:mod:`.config`), Kueue's objects (:mod:`.kueue`), ``apportion export k8s``
and ``export kueue`` (:mod:`.export`), and ``apportion cluster import --from k8s``
(:mod:`.importer`)."""
