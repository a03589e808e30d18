# ruff: noqa: E501  (exporter lines are kept verbatim, as long as the exporter prints them)
"""Real dcgm-exporter output, copied verbatim (lines as the sources print them), for parser tests."""

# DataDog/integrations-core, dcgm/tests/fixtures/metrics.txt: a scrape of dcgm-exporter on a
# Tesla T4 (driver 460.106.00), the GPU_UTIL and FB_* families.
DATADOG_T4 = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",device="nvidia0",modelName="Tesla T4",Hostname="424773df46e0",DCGM_FI_DRIVER_VERSION="460.106.00",DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 0
# HELP DCGM_FI_DEV_MEM_COPY_UTIL Memory utilization (in %).
# TYPE DCGM_FI_DEV_MEM_COPY_UTIL gauge
DCGM_FI_DEV_MEM_COPY_UTIL{gpu="0",UUID="GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",device="nvidia0",modelName="Tesla T4",Hostname="424773df46e0",DCGM_FI_DRIVER_VERSION="460.106.00",DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",device="nvidia0",modelName="Tesla T4",Hostname="424773df46e0",DCGM_FI_DRIVER_VERSION="460.106.00",DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 15109
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",device="nvidia0",modelName="Tesla T4",Hostname="424773df46e0",DCGM_FI_DRIVER_VERSION="460.106.00",DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 0
"""

# Same file, last line: an A10G whose GPU the exporter maps to a pod (container/namespace/pod).
DATADOG_A10G_POD_LINE = (
    'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-abc",device="nvidia0",modelName="NVIDIA A10G",'
    'Hostname="ip-11111",DCGM_FI_CUDA_DRIVER_VERSION="12040",DCGM_FI_DEV_BRAND="NVIDIA",'
    'DCGM_FI_DEV_MINOR_NUMBER="0",DCGM_FI_DEV_NAME="NVIDIA A10G",DCGM_FI_DEV_SERIAL="1111111",'
    'DCGM_FI_DRIVER_VERSION="550.144.03",DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter",container="ray-worker",'
    'namespace="ray-llm",pod="ray-1111111"} 0.000003'
)

# NVIDIA/dcgm-exporter README.md ("Quickstart on Kubernetes"): note the space after the comma,
# the empty pod labels of an unmapped GPU, and DCGM's blank sentinel 9223372036854775794.
NVIDIA_README_K8S = """\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
# HELP DCGM_FI_DEV_MEM_CLOCK Memory clock frequency (in MHz).
# TYPE DCGM_FI_DEV_MEM_CLOCK gauge
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",container="",namespace="",pod=""} 139
DCGM_FI_DEV_MEM_CLOCK{gpu="0", UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",container="",namespace="",pod=""} 405
DCGM_FI_DEV_MEMORY_TEMP{gpu="0", UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",container="",namespace="",pod=""} 9223372036854775794
"""
