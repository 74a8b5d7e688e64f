# The image of deploy/kuberay.yaml: Ray at the version the deploy configs pin, and kvmesh[gpu] from this clone.
#   docker build -f deploy/kuberay.Dockerfile -t <your registry>/kvmesh:latest . && docker push <...>
FROM rayproject/ray:2.60.0-py310-gpu
COPY --chown=ray . /kvmesh
RUN python -m pip install --no-cache-dir -e "/kvmesh[gpu]"
