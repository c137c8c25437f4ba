{{/*
CEL of the KAI compatibility policies (kai-compat.yaml; docs/coming-from-kai.md). A pod asks
for a fraction the KAI way with annotations; the pod policies read them into `variables`
(the same list in the mutating and the validating policy), the validating one refuses what
cannot be translated (`variables.problems`), the mutating one adds a pod claim named after
what was asked (`variables.claimName`: kai-<ts|sm>-x<GPUs>-<limit>-<request>, limit n (none),
b<bytes> or p<portion with d for the point>, request b<bytes> or p<product>), made from the
namespace's template "gpu-fraction-kai"; the claim policy turns that name into the claim.
*/}}

{{- define "gfd.kai.templateName" -}}
gpu-fraction-kai
{{- end -}}

{{/* The class the template names: none exists, so a claim the claim policy did not translate
     is never allocated, and the scheduler's message names it. */}}
{{- define "gfd.kai.placeholder" -}}
kai-annotations-not-translated
{{- end -}}

{{/* Does the pod carry any annotation of KAI's fraction requests? */}}
{{- define "gfd.kai.asks" -}}
object.metadata.?annotations.orValue({}).exists(k, k in ["gpu-fraction", "gpu-fraction.limit", "gpu-memory", "gpu-memory.limit", "gpu-fraction-num-devices", "gpu-fraction-container-name"] || (k.startsWith("nvidia.com/container.") && (k.endsWith(".gpu-memory.request") || k.endsWith(".gpu-memory.limit") || k.endsWith(".gpu-compute.mode") || k.endsWith(".gpus.devices"))) || (k.startsWith("kai.scheduler/container.") && k.endsWith(".gpu-memory.portion.limit")))
{{- end -}}

{{/* CEL map: product -> its portion of a card (double), for the products model. */}}
{{- define "gfd.kai.products" -}}
{{- $entries := list -}}
{{- if has "products" .Values.fractionModels -}}
{{- range (include "gfd.allProducts" . | fromJsonArray) -}}
{{- $f := include "gfd.fraction" .portion | fromJsonArray -}}
{{- $entries = append $entries (printf "%q: %d.0 / %d.0" .name (int (index $f 0)) (int (index $f 1))) -}}
{{- end -}}
{{- end -}}
{{- printf "{%s}" (join ", " $entries) -}}
{{- end -}}

{{/* The products as users read them: "eighth (1/8), quarter (1/4), ...". */}}
{{- define "gfd.kai.productText" -}}
{{- $entries := list -}}
{{- if has "products" .Values.fractionModels -}}
{{- range (include "gfd.allProducts" . | fromJsonArray) -}}
{{- $entries = append $entries (printf "%s (%s)" .name .portion) -}}
{{- end -}}
{{- end -}}
{{- join ", " $entries | default "none" -}}
{{- end -}}

{{/* A CEL string expression of decimal bytes (the argument) as a quantity: Gi or Mi where
     whole, else bytes. */}}
{{- define "gfd.kai.bytes" -}}
(int({{ . }}) % 1073741824 == 0 ? string(int({{ . }}) / 1073741824) + "Gi" : (int({{ . }}) % 1048576 == 0 ? string(int({{ . }}) / 1048576) + "Mi" : {{ . }}))
{{- end -}}

{{/* The variables of both pod policies. */}}
{{- define "gfd.kai.podVariables" -}}
{{- $label := include "gfd.tenantLabel" . -}}
- name: ann
  expression: object.metadata.?annotations.orValue({})
# The annotations that name a container: nvidia.com/container.<name>.<what>,
# kai.scheduler/container.<name>.gpu-memory.portion.limit (a container name has no dot).
- name: keyed
  expression: >-
    variables.ann.filter(k, (k.startsWith("nvidia.com/container.") && (k.endsWith(".gpu-memory.request")
    || k.endsWith(".gpu-memory.limit") || k.endsWith(".gpu-compute.mode") || k.endsWith(".gpus.devices")))
    || (k.startsWith("kai.scheduler/container.") && k.endsWith(".gpu-memory.portion.limit")))
- name: containerNames
  expression: object.spec.containers.map(c, c.name)
- name: initNames
  expression: object.spec.?initContainers.orValue([]).map(c, c.name)
# The container the fraction is for (KAI's rules): the one a gpu-memory.request annotation
# names, else gpu-fraction-container-name (an app or init container), else the first one.
- name: keyedRequests
  expression: >-
    variables.keyed.filter(k, k.startsWith("nvidia.com/container.") && k.endsWith(".gpu-memory.request"))
- name: target
  expression: >-
    variables.keyedRequests.size() > 0 ? variables.keyedRequests[0].split(".")[2]
    : variables.ann[?"gpu-fraction-container-name"].orValue(variables.containerNames.size() > 0
    ? variables.containerNames[0] : "")
- name: isInit
  expression: '!(variables.target in variables.containerNames) && variables.target in variables.initNames'
- name: p
  expression: '"nvidia.com/container." + variables.target'
- name: mode
  expression: variables.ann[?(variables.p + ".gpu-compute.mode")].orValue("time-slicing")
- name: nvRequest
  expression: variables.ann[?(variables.p + ".gpu-memory.request")].orValue("")
- name: legacyMemory
  expression: variables.ann[?"gpu-memory"].orValue("")
- name: legacyOk
  expression: variables.legacyMemory.matches(r'^[0-9]{1,7}$') && int(variables.legacyMemory) > 0
# The guaranteed memory as a quantity ("" for none) and the annotation it came from.
- name: memRequest
  expression: >-
    variables.nvRequest != "" ? variables.nvRequest
    : (variables.legacyMemory != "" ? variables.legacyMemory + "Mi" : "")
- name: requestKey
  expression: 'variables.nvRequest != "" ? variables.p + ".gpu-memory.request" : "gpu-memory"'
- name: limitKey
  expression: >-
    (variables.p + ".gpu-memory.limit") in variables.ann ? variables.p + ".gpu-memory.limit" : "gpu-memory.limit"
- name: memLimit
  expression: variables.ann[?variables.limitKey].orValue("")
- name: fraction
  expression: variables.ann[?"gpu-fraction"].orValue("")
- name: portionLimitKey
  expression: >-
    "gpu-fraction.limit" in variables.ann ? "gpu-fraction.limit"
    : "kai.scheduler/container." + variables.target + ".gpu-memory.portion.limit"
- name: fractionLimit
  expression: variables.ann[?variables.portionLimitKey].orValue("")
- name: countText
  expression: variables.ann[?"gpu-fraction-num-devices"].orValue("1")
- name: count
  expression: 'variables.countText.matches(r''^[0-9]{1,2}$'') ? int(variables.countText) : 0'
- name: memory
  expression: variables.memRequest != ""
# A quantity of whole bytes (1.5Gi is; 1.5 is not), at least one byte, below 1P (exact as a
# double: whole numbers below 2^53 are).
- name: requestOk
  expression: >-
    variables.memory && isQuantity(variables.memRequest)
    && quantity(variables.memRequest).isGreaterThan(quantity("0"))
    && quantity(variables.memRequest).asApproximateFloat() < 1000000000000000.0
    && quantity(variables.memRequest).asApproximateFloat() == double(int(quantity(variables.memRequest).asApproximateFloat()))
- name: limitOk
  expression: >-
    variables.memLimit != "" && isQuantity(variables.memLimit)
    && quantity(variables.memLimit).isGreaterThan(quantity("0"))
    && quantity(variables.memLimit).asApproximateFloat() < 1000000000000000.0
    && quantity(variables.memLimit).asApproximateFloat() == double(int(quantity(variables.memLimit).asApproximateFloat()))
- name: portionPattern
  expression: r'^(0?\.[0-9]{1,5}|1(\.0{1,5})?)$'
- name: products
  expression: {{ include "gfd.kai.products" . | quote }}
# The product whose portion gpu-fraction is ("" for none).
- name: productList
  expression: >-
    variables.fraction.matches(variables.portionPattern)
    ? variables.products.filter(n, double(variables.fraction) - variables.products[n] < 0.000001
    && variables.products[n] - double(variables.fraction) < 0.000001) : []
- name: product
  expression: 'variables.productList.size() > 0 ? variables.productList[0] : ""'
- name: fractionLimitOk
  expression: variables.fractionLimit.matches(variables.portionPattern)
- name: suffix
  expression: 'variables.mode == "sm-sharing" ? "-sm-sharing" : ""'
- name: deviceClass
  expression: >-
    variables.memory ? "gpu-memory" + variables.suffix : "gpu-" + variables.product + variables.suffix
- name: portionCaps
  expression: {{ include "gfd.cel.portionCaps" . | quote }}
- name: byteCaps
  expression: {{ include "gfd.cel.byteCaps" . | quote }}
- name: noBurst
  expression: {{ include "gfd.cel.noBurst" . | quote }}
- name: above
  expression: >-
    variables.requestOk && variables.limitOk
    && quantity(variables.memLimit).compareTo(quantity(variables.memRequest)) > 0
# Every reason the pod cannot be translated, each naming the annotation and what to write.
- name: problems
  expression: >-
    variables.keyed.filter(k, k.split(".")[2] != variables.target).map(k, "annotation " + k
    + " names container " + k.split(".")[2] + ", but the fraction is for container "
    + variables.target + " (the container of a gpu-memory.request annotation, else
    gpu-fraction-container-name, else the first container): one container of a pod takes a
    fraction through annotations (as with KAI); name that one, and give others a
    ResourceClaimTemplate (docs/user-guide.md)")
    + (!(variables.target in variables.containerNames) && !(variables.target in variables.initNames)
    ? ["container " + variables.target + " (named by "
    + (variables.keyedRequests.size() > 0 ? variables.keyedRequests[0] : "gpu-fraction-container-name")
    + ") is not a container of this pod"] : [])
    + (variables.keyedRequests.size() > 0 && "gpu-fraction-container-name" in variables.ann
    && variables.ann["gpu-fraction-container-name"] != variables.target
    ? ["gpu-fraction-container-name " + variables.ann["gpu-fraction-container-name"]
    + " does not match container " + variables.target + " of annotation "
    + variables.keyedRequests[0] + ": name one container"] : [])
    + ("gpu-fraction.limit" in variables.ann && ("kai.scheduler/container." + variables.target
    + ".gpu-memory.portion.limit") in variables.ann && variables.ann["gpu-fraction.limit"]
    != variables.ann["kai.scheduler/container." + variables.target + ".gpu-memory.portion.limit"]
    ? ["gpu-fraction.limit and kai.scheduler/container." + variables.target
    + ".gpu-memory.portion.limit differ: write one of them"] : [])
    + ((variables.p + ".gpu-memory.limit") in variables.ann && "gpu-memory.limit" in variables.ann
    && variables.ann[variables.p + ".gpu-memory.limit"] != variables.ann["gpu-memory.limit"]
    ? [variables.p + ".gpu-memory.limit and gpu-memory.limit differ: write one of them"] : [])
    + variables.keyed.filter(k, k.endsWith(".gpus.devices")).map(k, k + " is written by KAI's
    binder for the GPUs it chose; here the scheduler chooses them: remove it")
    + (!variables.memory && variables.fraction == "" ? ["annotations "
    + variables.ann.filter(k, k in variables.keyed || k in ["gpu-fraction", "gpu-fraction.limit",
    "gpu-memory.limit", "gpu-fraction-num-devices", "gpu-fraction-container-name"]).join(", ")
    + " ask for no GPU memory: add " + variables.p + ".gpu-memory.request (the guaranteed memory,
    e.g. 20Gi) or gpu-fraction (a portion of a card, e.g. \"0.5\")"] : [])
    + (variables.memory && variables.fraction != "" ? ["gpu-fraction " + variables.fraction
    + " and " + variables.requestKey + " " + variables.memRequest + " both ask for a share of a
    GPU: keep one (a portion of a card, or an amount of memory)"] : [])
    + (variables.legacyMemory != "" && !variables.legacyOk ? ["gpu-memory " + variables.legacyMemory
    + " must be a whole number of MiB (KAI's unit) from 1 to 9999999, e.g. \"20480\"; or write "
    + variables.p + ".gpu-memory.request: 20Gi"] : [])
    + (variables.nvRequest != "" && variables.legacyMemory != "" && variables.legacyOk
    && !(variables.requestOk && quantity(variables.nvRequest).compareTo(quantity(variables.legacyMemory
    + "Mi")) == 0) ? ["gpu-memory " + variables.legacyMemory + " (MiB) differs from "
    + variables.requestKey + " " + variables.nvRequest + ": write one of them"] : [])
    + (variables.nvRequest != "" && !variables.requestOk ? [variables.requestKey + " "
    + variables.nvRequest + " must be a Kubernetes quantity of whole bytes, at least 1 and below
    1P, e.g. 40Gi"] : [])
    + (variables.memLimit != "" && !variables.limitOk ? [variables.limitKey + " "
    + variables.memLimit + " must be a Kubernetes quantity of whole bytes, at least 1 and below
    1P, e.g. 60Gi"] : [])
    + (variables.memLimit != "" && !variables.memory && variables.fraction != ""
    ? [variables.limitKey + " is a ceiling for a memory request; with gpu-fraction write
    gpu-fraction.limit (a portion of a card, e.g. \"0.8\")"] : [])
    + (variables.requestOk && variables.limitOk
    && quantity(variables.memLimit).compareTo(quantity(variables.memRequest)) < 0
    ? [variables.limitKey + " " + variables.memLimit + " is below " + variables.requestKey + " "
    + variables.memRequest + ": the limit is the ceiling above the guaranteed memory; write a
    limit of at least the request, or none"] : [])
    + (variables.fraction != "" && variables.product == "" ? ["gpu-fraction " + variables.fraction
    + " is no product of this cluster; write the portion of one of {{ include "gfd.kai.productText" . }},
    or ask for an amount of memory with " + variables.p + ".gpu-memory.request (e.g. 20Gi)"] : [])
    + (variables.fractionLimit != "" && variables.fraction == "" ? [variables.portionLimitKey
    + " needs gpu-fraction (it is a ceiling above that portion)"] : [])
    + (variables.fractionLimit != "" && !variables.fractionLimitOk ? [variables.portionLimitKey
    + " " + variables.fractionLimit + " must be a portion of a card in (0, 1] with at most 5
    decimals, e.g. \"0.8\""] : [])
    + (variables.fractionLimitOk && variables.product != ""
    && double(variables.fractionLimit) <= double(variables.fraction) ? [variables.portionLimitKey
    + " " + variables.fractionLimit + " must be greater than gpu-fraction " + variables.fraction
    + " (it is the ceiling above it), or absent"] : [])
    + (variables.count < 1 || variables.count > 64 ? ["gpu-fraction-num-devices "
    + variables.countText + " must be a whole number from 1 to 64"] : [])
    + (!(variables.mode in ["time-slicing", "sm-sharing"]) ? [variables.p + ".gpu-compute.mode "
    + variables.mode + " must be time-slicing or sm-sharing"] : [])
    + (variables.mode in ["time-slicing", "sm-sharing"] && !(variables.mode in {{ .Values.computeModes | toJson }})
    ? ["this cluster offers no " + variables.mode + " classes (" + variables.p
    + ".gpu-compute.mode); ask for {{ .Values.computeModes | join " or " }}"] : [])
    {{- if not (has "capacity" .Values.fractionModels) }}
    + (variables.memory ? [variables.requestKey + " asks for an amount of memory and this cluster
    offers no gpu-memory classes; use gpu-fraction"] : [])
    {{- end }}
    + ((object.spec.containers + object.spec.?initContainers.orValue([])).exists(c,
    "nvidia.com/gpu" in c.?resources.?limits.orValue({})
    || "nvidia.com/gpu" in c.?resources.?requests.orValue({})) ? ["a container asks for
    nvidia.com/gpu as well: ask for whole GPUs or for a fraction, not both"] : [])
    + (variables.above && variables.deviceClass in variables.noBurst ? [variables.limitKey + " "
    + variables.memLimit + " is above " + variables.requestKey + " " + variables.memRequest
    + " and DeviceClass " + variables.deviceClass + " allows no memory above the request (an
    admin allows it with classLimits, docs/admin-guide.md): drop the limit"] : [])
    + (variables.memory && variables.limitOk && variables.deviceClass in variables.byteCaps
    && quantity(variables.memLimit).compareTo(quantity(variables.byteCaps[variables.deviceClass])) > 0
    ? [variables.limitKey + " " + variables.memLimit + " exceeds what DeviceClass "
    + variables.deviceClass + " allows (" + variables.byteCaps[variables.deviceClass] + ")"] : [])
    + (variables.product != "" && variables.fractionLimitOk
    && variables.deviceClass in variables.portionCaps
    && double(variables.fractionLimit) > variables.portionCaps[variables.deviceClass] + 0.000001
    ? [variables.portionLimitKey + " " + variables.fractionLimit + " exceeds what DeviceClass "
    + variables.deviceClass + " allows (" + string(variables.portionCaps[variables.deviceClass])
    + " of a card; an admin allows more with classLimits, docs/admin-guide.md)"] : [])
    {{- if .Values.tenants.requireGrant }}
    + (namespaceObject.metadata.?labels[?"{{ $label }}"].orValue("") != "true"
    ? ["namespace " + namespaceObject.metadata.name + " is not granted this driver's GPUs (the
    label {{ $label }}=true, set by a cluster admin: docs/admin-guide.md, \"Tenants\")"] : [])
    {{- end }}
# The pod claim's name: what was asked, for the claim policy to read back.
- name: claimName
  expression: >-
    variables.problems.size() > 0 ? "" : "kai-" + (variables.mode == "sm-sharing" ? "sm" : "ts")
    + "-x" + string(variables.count) + "-"
    + (variables.memory ? (variables.memLimit == "" ? "n" : "b" + string(int(quantity(variables.memLimit).asApproximateFloat())))
    : (variables.fractionLimit == "" ? "n" : "p" + variables.fractionLimit.replace(".", "d")))
    + "-" + (variables.memory ? "b" + string(int(quantity(variables.memRequest).asApproximateFloat())) : "p" + variables.product)
{{- end -}}
