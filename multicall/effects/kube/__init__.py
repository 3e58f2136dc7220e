"""The Kubernetes API clients, on the HTTP/1.1 transport of effects/http.py:

- config.py: what a client reads before it connects (kubeconfig, token, CA, the deadline);
- client.py: the plugin's client (three GETs) and client-go's wording of API answers;
- warm.py: a node agent worker's warm connections, handed to the client explicitly;
- stream.py: a controller's session: LIST, WATCH, DELETE, POST, in-cluster config.

Empty on purpose: importing the package loads none of them (an ADD loads config and client).
"""
