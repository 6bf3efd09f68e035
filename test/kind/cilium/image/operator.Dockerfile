# SPDX-License-Identifier: Apache-2.0
#
# Cilium's operator image (images/operator/Dockerfile, the generic variant)
# on the same Debian base as the agent's image.
ARG BASE
FROM ${BASE}
COPY cilium-operator-generic /usr/bin/
WORKDIR /
CMD ["/usr/bin/cilium-operator-generic"]
