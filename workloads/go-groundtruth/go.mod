module tlsprof/workloads/go-groundtruth

go 1.19
