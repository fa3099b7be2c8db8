"""Go's behaviour, re-created where FMA's Go controllers and Kubernetes define the wire: YAML and JSON as Go's
libraries read and write them, Go templates, and strategic merge patches over a Pod. Kept apart so the controllers'
own code reads as Python, and so what is emulated (and against which Go version) is in one place.
"""
