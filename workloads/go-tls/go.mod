module tlsprof/workloads/go-tls

go 1.19
